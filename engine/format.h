// format.h: human-readable numbers (bytes in KiB/MiB/GiB, fixed decimals) and parsing of sizes ("24GB").
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace engine {

std::string format_bytes(size_t bytes);            // "17.31 GiB", "512 B"
std::string format_fixed(double v, int decimals);  // "41.3"
// Parses "24GB", "24GiB", "1.5G", "512MB", "1000000" (bytes). GB and GiB both mean 2^30 here as the
// GPU vendors' "GB" on a card is binary; the suffix is checked and a bad string is an Error.
size_t parse_bytes(const std::string& s);
// Appends the UTF-8 encoding of one Unicode code point.
void append_utf8(std::string& out, uint32_t code_point);

}  // namespace engine
