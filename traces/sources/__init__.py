"""Where traces come from: one module (or sub-package) per source, one entry point."""
