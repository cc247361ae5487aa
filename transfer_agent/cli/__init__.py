"""The ``fstream`` command line (``main``): receive, send and the job commands; installed packages add more by entry point."""
