// Parses template source into a Template tree, with jinja2's operator precedence. Tags outside the
// supported subset (extends, include, block, call, filter, with, ...) fail here, naming the tag and line.
#pragma once

#include <string_view>

#include "engine/core/chat_template/ast.h"

namespace kvfleet::jinja {

Template parse_template(std::string_view source);

}  // namespace kvfleet::jinja
