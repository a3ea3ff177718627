"""One small plotting function per figure. Each reads tidy data frames and returns a matplotlib Figure."""
