"""dnnfab.models"""
