"""Network-namespace testbed (Linux namespaces, BMv2, Mininet): the package ``testbed``."""
