"""Evaluation and statistics: metrics of accuracy matrices (`metrics`) and how sure a number is (`stats`)."""
