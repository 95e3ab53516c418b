"""io — see DESIGN and the issues that fill it."""
