# DESIGN's dependency direction, enforced when the build is configured:
#   app -> train -> plan -> {model, parallel, io} -> kernels -> core
# Every quoted #include of a project header must name a layer the including
# file's layer may depend on. A violation stops the configure step (and so
# the build) with the file, the line and the rule it breaks.

# layer: directories (relative to the source root) and the layers it may use.
set(_layers core kernels model parallel io plan train app)
set(_dirs_core src/core)
set(_dirs_kernels kernels/common kernels/host kernels/cuda)
set(_dirs_model src/model)
set(_dirs_parallel src/parallel)
set(_dirs_io io)
set(_dirs_plan src/plan)
set(_dirs_train src/train)
set(_dirs_app app)
set(_uses_core core)
set(_uses_kernels core kernels)
set(_uses_model core kernels model)
set(_uses_parallel core parallel)
set(_uses_io core io)
set(_uses_plan core kernels model parallel io plan)
set(_uses_train core kernels model parallel io plan train)
set(_uses_app core kernels model parallel io plan train app)
# The first path component of an include, by layer.
set(_prefix_core core)
set(_prefix_common kernels)
set(_prefix_host kernels)
set(_prefix_cuda kernels)
set(_prefix_model model)
set(_prefix_parallel parallel)
set(_prefix_plan plan)
set(_prefix_train train)

file(GLOB _io_headers RELATIVE ${PROJECT_SOURCE_DIR}/io ${PROJECT_SOURCE_DIR}/io/*.hpp)
set(_violations "")
foreach(_layer ${_layers})
  foreach(_dir ${_dirs_${_layer}})
    file(GLOB _files ${PROJECT_SOURCE_DIR}/${_dir}/*.hpp ${PROJECT_SOURCE_DIR}/${_dir}/*.cpp
         ${PROJECT_SOURCE_DIR}/${_dir}/*.cu ${PROJECT_SOURCE_DIR}/${_dir}/*.cuh)
    foreach(_file ${_files})
      file(STRINGS ${_file} _includes REGEX "^#include \"")
      foreach(_inc ${_includes})
        string(REGEX REPLACE "^#include \"([^\"]*)\".*" "\\1" _path "${_inc}")
        if(_path MATCHES "/")
          string(REGEX REPLACE "/.*" "" _first "${_path}")
          set(_target "${_prefix_${_first}}")
        elseif(_path IN_LIST _io_headers AND NOT EXISTS ${PROJECT_SOURCE_DIR}/${_dir}/${_path})
          set(_target io)  # io's headers are included by their bare names
        else()
          set(_target ${_layer})  # a header beside the file
        endif()
        if(_target STREQUAL "")
          continue()  # not a project header (a generated or third-party one)
        endif()
        if(NOT _target IN_LIST _uses_${_layer})
          file(RELATIVE_PATH _rel ${PROJECT_SOURCE_DIR} ${_file})
          string(APPEND _violations "\n  ${_rel}: #include \"${_path}\": ${_layer} may not use ${_target}")
        endif()
      endforeach()
    endforeach()
  endforeach()
endforeach()
if(_violations)
  message(FATAL_ERROR "Includes that break the layering (app -> train -> {model, parallel, io} "
                      "-> kernels -> core):${_violations}")
endif()
