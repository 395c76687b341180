"""scepsy: the public façade and the command line."""
