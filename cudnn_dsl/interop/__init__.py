"""Other formats: the frontend's graph JSON in and out, ejected scripts, coverage of the frontend's ops."""
