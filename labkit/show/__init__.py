"""What the notebooks and the report show: tables, plots and tokenised examples."""
