// A scheme instance and what keeps its code loaded. No LibTorch include: cheap to pass around.
#pragma once

#include <map>
#include <memory>
#include <string>

namespace normlab {

class Scheme;

struct SchemeHandle {
  std::shared_ptr<Scheme> scheme;  // its deleter holds the plugin library
  std::string name;
  std::string file;     // the plugin library it came from
  std::string version;  // the plugin's declared version
  // Every parameter as resolved (defaults included), its value in shortest exact text: part of a
  // checkpoint's model identity (a Mix-LN α = 1 checkpoint is another function than α = 0).
  std::map<std::string, std::string> params;
};

}  // namespace normlab
