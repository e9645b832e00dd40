"""The kit's machinery in the notebook kernel: it starts runs, talks to live ranks and shows what
they did. Nothing here is imported inside a rank."""
