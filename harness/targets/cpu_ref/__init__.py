"""cpu-ref: the kind of the CPU reference, which every variant is compared against."""
