"""Documents as pages: a PDF rendered to one image per page, for a page model (ColPali and kin).

pypdfium2 (PDFium, the `pdf` extra) renders each page at the model's resolution: the scale that
gives the page about as many pixels as the model's processor works at (`page_pixels`), its aspect
kept, so nothing is rendered finer than the model will look. The page count is read and checked
before any page is rendered, and each page's pixels before it is drawn; the pages come back as PNG
images, the bytes an image input holds, so that every later step is the image path's.

PDFium is not thread-safe: one lock serialises every call into it in the process.
"""

from __future__ import annotations

import io
import math
import threading
from dataclasses import dataclass

from model_registry.errors import InvalidInput, ModelUnavailable
from model_registry.types import Media, Modality

_pdfium = threading.Lock()


@dataclass(frozen=True, slots=True)
class Page:
    """One rendered page: its number in its document (from 1) and its image."""

    number: int
    image: Media


def is_pdf(data: bytes) -> bool:
    """A PDF by its header (`%PDF-`, which may follow a little leading junk, as readers allow)."""
    return b"%PDF-" in data[:1024]


def render(data: bytes, index: int, *, page_pixels: int, max_pages: int, max_pixels: int) -> list[Page]:
    """Each page of the PDF `data` (input `index`) as a PNG image of about `page_pixels` pixels.

    Refused (400) before any rendering: a document that PDFium cannot open, one with no pages or
    more than `max_pages`. A page whose image would exceed `max_pixels` is drawn smaller."""
    try:
        import pypdfium2
    except ImportError as error:
        raise ModelUnavailable("rendering a PDF's pages needs pypdfium2: pip install 'infinity-server[pdf]'") from error
    with _pdfium:
        try:
            document = pypdfium2.PdfDocument(data)
        except pypdfium2.PdfiumError as error:
            raise InvalidInput(f"input {index}: the PDF cannot be read ({error})", param="input") from None
        try:
            count = len(document)
            if not 1 <= count <= max_pages:
                raise InvalidInput(
                    f"input {index}: the PDF has {count} pages; a request takes 1 to {max_pages} pages (max_pdf_pages)",
                    param="input",
                )
            return [_page(document, number, index, page_pixels, max_pixels) for number in range(count)]
        finally:
            document.close()


def _page(document: object, number: int, index: int, page_pixels: int, max_pixels: int) -> Page:
    page = document[number]  # type: ignore[index]
    try:
        width, height = page.get_size()
        if width <= 0 or height <= 0:
            raise InvalidInput(f"input {index}: page {number + 1} of the PDF has no area", param="input")
        scale = math.sqrt(min(page_pixels, max_pixels) / (width * height))
        bitmap = page.render(scale=scale)
        try:
            picture = bitmap.to_pil().convert("RGB")
        finally:
            bitmap.close()
    finally:
        page.close()
    encoded = io.BytesIO()
    picture.save(encoded, format="PNG", compress_level=1)
    return Page(number + 1, Media(Modality.IMAGE, encoded.getvalue(), source=f"page {number + 1}"))
