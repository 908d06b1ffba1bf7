# Writes the dashboard page (IN) into a C++ source (OUT) as one raw string: router/dashboard/dashboard.h.
file(READ ${IN} page)
string(FIND "${page}" ")kvfleet_page\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw string's end marker )kvfleet_page\"")
endif()
file(WRITE ${OUT}.tmp "#include \"router/dashboard/dashboard.h\"\n\nnamespace kvfleet::router {\n\nstd::string_view dashboard_html() {\n  static constexpr char page[] = R\"kvfleet_page(${page})kvfleet_page\";\n  return {page, sizeof(page) - 1};\n}\n\n}  // namespace kvfleet::router\n")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
