"""The code each stage notebook calls, one module per notebook (01 baseline … 05 comparison), the stage context, the
stages' file names and records, and the run metrics read from their files."""
