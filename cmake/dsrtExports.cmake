# dsrt_exports_map(OUT): writes the linker version script of libdsrt.so and
# libdsrt_train.so to OUT. Exported: every function the public headers
# declare with DSRT_API (include/dsrt/*.h), and the internal functions
# libdsrt_train and the modules call (cmake/dsrt-internals.txt); everything
# else is local.
# The headers and the list are configure dependencies: a new public function
# is exported at the next build.
function(dsrt_exports_map out)
  file(GLOB headers ${PROJECT_SOURCE_DIR}/include/dsrt/*.h)
  set(list ${PROJECT_SOURCE_DIR}/cmake/dsrt-internals.txt)
  set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
    ${headers} ${list})
  set(public "")
  foreach(h ${headers})
    file(READ ${h} text)
    # "DSRT_API <type> name(": the name before the first parenthesis.
    string(REGEX MATCHALL "DSRT_API[^;(]*[ *]dsrt_[A-Za-z0-9_]+[ \t\n]*\\(" decls "${text}")
    foreach(d ${decls})
      string(REGEX MATCH "dsrt_[A-Za-z0-9_]+[ \t\n]*\\($" name "${d}")
      string(REGEX REPLACE "[ \t\n]*\\($" "" name "${name}")
      list(APPEND public ${name})
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES public)
  list(SORT public)
  file(STRINGS ${list} internals REGEX "^dsrt__[A-Za-z0-9_]+$")
  set(body "/* Made by cmake/dsrtExports.cmake: the public API (DSRT_API in\n   include/dsrt/*.h) and the internals libdsrt_train and the\n   modules call (cmake/dsrt-internals.txt). */\n{\n  global:\n")
  foreach(name ${public} ${internals})
    string(APPEND body "    ${name};\n")
  endforeach()
  string(APPEND body "  local:\n    *;\n};\n")
  file(CONFIGURE OUTPUT ${out} CONTENT "${body}" @ONLY)
  set(DSRT_PUBLIC_NAMES ${public} PARENT_SCOPE)
endfunction()
