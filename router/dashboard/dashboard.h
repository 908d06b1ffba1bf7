// The router's live fleet page (GET /dashboard): router/dashboard/dashboard.html, embedded at build
// time by embed.cmake so that the page stays a plain HTML file to edit. The page is static and holds no
// data; it reads /admin/replicas (admin-protected) and /metrics from the router it was served by.
#pragma once

#include <string_view>

namespace kvfleet::router {

std::string_view dashboard_html();

}  // namespace kvfleet::router
