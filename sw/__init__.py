"""dnnfab.sw"""
