"""dnnfab.cosim"""
