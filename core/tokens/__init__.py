"""Tokens: the tokenizer interface (Encoded, PieceTable, the toy model's WordTokenizer, how
pieces are displayed) and word grouping of pieces."""
