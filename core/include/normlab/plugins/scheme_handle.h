// A scheme instance and what keeps its code loaded. No LibTorch include: cheap to pass around.
#pragma once

#include <memory>
#include <string>

namespace normlab {

class Scheme;

struct SchemeHandle {
  std::shared_ptr<Scheme> scheme;  // its deleter holds the plugin library
  std::string name;
  std::string file;  // the plugin library it came from
};

}  // namespace normlab
