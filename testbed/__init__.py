"""Network-namespace testbed, installed as dlcp.testbed."""
