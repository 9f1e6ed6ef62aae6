"""The model as files and graphs: loading and saving (input checks, external data, atomic
writes), walking a model's graphs and subgraphs, shape inference merged back by name, and the one
place an onnxruntime session is opened (``sessions.open_session``)."""
