"""The web API (LMSP part B): one module per area; resources stay thin."""
