"""The code each stage notebook calls, one module per notebook (01 baseline … 05 comparison), and the stage context."""
