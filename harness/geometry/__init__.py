"""Engine geometries as a dimension of a run: the named shapes (``catalog``), whether one fits
this machine (``fit``)."""
