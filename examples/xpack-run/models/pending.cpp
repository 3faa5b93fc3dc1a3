// Placeholders for architectures whose model files have not landed yet. They
// are weak so the real factory (models/<arch>.cpp) wins as soon as it is linked;
// its author deletes the matching lines here.
#include "model.h"

namespace xrun {

}  // namespace xrun
