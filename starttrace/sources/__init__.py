"""Sources: everything that produces the run type (`starttrace.run.Run`) from recorded data."""
