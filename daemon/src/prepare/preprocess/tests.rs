//! Preprocessing against transformers' image processors and Pillow (fixtures made by
//! `scripts/make-vision-fixtures.py`).
