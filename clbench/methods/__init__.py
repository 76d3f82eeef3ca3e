"""(placeholder: written by the layout change)"""
