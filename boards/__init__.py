"""dnnfab.boards"""
