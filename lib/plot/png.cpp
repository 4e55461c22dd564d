// SVG -> PNG through librsvg's document renderer onto a cairo image surface.
#include "lib/plot/png.h"

#include <cmath>
#include <cstdio>

#include "lib/core/atomic_file.h"
#include "lib/core/error.h"

#ifdef DS_HAVE_RSVG
#include <cairo.h>
#include <librsvg/rsvg.h>
#endif

namespace ds::plot {

#ifdef DS_HAVE_RSVG

bool png_supported() { return true; }

namespace {

cairo_status_t append_bytes(void* out, const unsigned char* data, unsigned int n) {
  static_cast<std::string*>(out)->append(reinterpret_cast<const char*>(data), n);
  return CAIRO_STATUS_SUCCESS;
}

}  // namespace

std::string render_png(const std::string& svg, const std::string& path, double scale) {
  DS_USER_CHECK(scale > 0 && scale <= 8, "--png-scale must be in (0, 8], got {}", scale);
  GError* err = nullptr;
  RsvgHandle* h = rsvg_handle_new_from_data(reinterpret_cast<const guint8*>(svg.data()), svg.size(), &err);
  if (!h) {
    const std::string msg = err ? err->message : "unknown error";
    if (err) g_error_free(err);
    DS_USER_ERROR("cannot render '{}': librsvg rejected the SVG: {}", path, msg);
  }
  gdouble w = 0, hgt = 0;
  if (!rsvg_handle_get_intrinsic_size_in_pixels(h, &w, &hgt)) w = hgt = 0;
  const int pw = static_cast<int>(std::ceil(w * scale)), ph = static_cast<int>(std::ceil(hgt * scale));
  if (pw <= 0 || ph <= 0 || pw > 32767 || ph > 32767) {
    g_object_unref(h);
    DS_USER_ERROR("cannot render '{}': the picture would be {}x{} pixels", path, pw, ph);
  }
  cairo_surface_t* surface = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, pw, ph);
  cairo_t* cr = cairo_create(surface);
  const RsvgRectangle viewport{0, 0, static_cast<double>(pw), static_cast<double>(ph)};
  const bool ok = rsvg_handle_render_document(h, cr, &viewport, &err);
  cairo_destroy(cr);
  g_object_unref(h);
  std::string msg;
  if (!ok) {
    msg = err ? err->message : "unknown error";
    if (err) g_error_free(err);
  }
  std::string png;
  cairo_status_t st = CAIRO_STATUS_SUCCESS;
  if (ok) st = cairo_surface_write_to_png_stream(surface, append_bytes, &png);
  cairo_surface_destroy(surface);
  if (!ok) DS_USER_ERROR("cannot render '{}': {}", path, msg);
  if (st != CAIRO_STATUS_SUCCESS) DS_USER_ERROR("cannot render '{}': {}", path, cairo_status_to_string(st));
  return png;
}

void write_png(const std::string& svg, const std::string& path, double scale) {
  write_file_atomic(path, render_png(svg, path, scale));
}

#else

bool png_supported() { return false; }

std::string render_png(const std::string&, const std::string& path, double) {
  DS_USER_ERROR("cannot write '{}': this dsplot was built without librsvg (Debian package librsvg2-dev), so it "
                "writes SVG only; write .svg, or install librsvg2-dev and rebuild", path);
}

void write_png(const std::string& svg, const std::string& path, double) { render_png(svg, path, 1.0); }

#endif

}  // namespace ds::plot
