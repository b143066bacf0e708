"""metal_exec"""
