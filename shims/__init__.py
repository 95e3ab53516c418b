"""Framework adapters (DDP comm hook, process group), installed as dlcp.shims."""
