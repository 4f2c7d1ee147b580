"""Server-side command-line tools: `sundial migrate`, `sundial keys`, `sundial services`."""
