"""Reports of simulations: rich tables and matplotlib plots (written as PNG files)."""
