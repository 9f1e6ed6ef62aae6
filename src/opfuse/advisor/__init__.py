"""The model advisor: profile a model, group the operators a backend could fuse, rank the
groups by measured time and report them in the sections of Ascend's model advisor."""
