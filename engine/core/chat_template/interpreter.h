// Executes a parsed Template. One Interpreter per render call: the tree is read-only, every mutable
// thing (scopes, namespace objects, output) lives in the call, so renders can run concurrently.
#pragma once

#include <string>

#include "engine/core/chat_template/ast.h"

namespace kvfleet::jinja {

// Fails with "unsupported filter 'x' at line N" / "unsupported test 'x' at line N" for names outside
// the supported set, so that a template is rejected when it is loaded rather than at some request.
void validate_template(const Template& t);

// `context` holds the template's variables; the globals (namespace, range, dict, raise_exception,
// strftime_now) sit beneath it. Throws TemplateError.
std::string render_template(const Template& t, const Dict& context);

}  // namespace kvfleet::jinja
