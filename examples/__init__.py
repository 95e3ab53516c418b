"""Examples, installed as dlcp.examples (run them with torchrun or `dlcp launch`)."""
