"""Views: one module per output format, each over the run type or the analysis of it."""
