#include "muse/engine/default_model.h"

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>

#include <vector>

namespace muse {

namespace {
bool is_model_dir(const std::string& dir) {
  struct stat st;
  return stat((dir + "/config.json").c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
std::string executable_dir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  std::string path(buf, size_t(n));
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}
}  // namespace

Result<std::string> default_model_dir() {
  std::vector<std::string> places;
  if (std::string exe = executable_dir(); !exe.empty()) {
    places.push_back(exe + "/../models/muse-tiny");
    places.push_back(exe + "/models/muse-tiny");
  }
  places.push_back(std::string(MUSE_SOURCE_DIR) + "/models/muse-tiny");
  for (const auto& p : places) {
    if (!is_model_dir(p)) continue;
    char real[PATH_MAX];
    return std::string(realpath(p.c_str(), real) ? real : p.c_str());
  }
  std::string list;
  for (const auto& p : places) list += (list.empty() ? "" : ", ") + p;
  return make_error("no model given and the embedded model models/muse-tiny was not found (looked in " + list +
                    "); pass a model directory");
}

}  // namespace muse
