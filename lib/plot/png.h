// PNG output for dsplot: the SVG that render_svg() writes, rasterized by
// librsvg (with cairo; Debian's librsvg2-dev), so the PNG shows exactly what
// the SVG does and no drawing code is written twice. Builds without librsvg
// have no PNG output (png_supported() is false).
#pragma once
#include <string>

namespace ds::plot {

bool png_supported();
// The PNG bytes of `svg` rendered at `scale` (1 = the SVG's pixel size);
// UserError naming PATH (the output it is for) on failure.
std::string render_png(const std::string& svg, const std::string& path, double scale);
// Renders `svg` at `scale` (1 = the SVG's pixel size) into PATH atomically
// (a temporary file renamed into place). UserError naming PATH on failure.
void write_png(const std::string& svg, const std::string& path, double scale);

}  // namespace ds::plot
