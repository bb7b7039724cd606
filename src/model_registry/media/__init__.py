"""Images, audio and documents: decoding with limits, a PDF's pages, and the similarity functions
that score vectors."""
