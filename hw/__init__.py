"""dnnfab.hw"""
