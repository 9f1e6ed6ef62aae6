"""The model as files and graphs: loading and saving (input checks, external data, atomic
writes), walking a model's graphs and subgraphs, and shape inference merged back by name."""
