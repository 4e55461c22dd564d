// World info: DeepSpeed's encoding of the active resources (url-safe base64 of
// the JSON host -> slots map, with Python json.dumps spacing), so a dsrun plan
// can be compared with DeepSpeed's byte for byte. Pure.
#pragma once
#include <string>

#include "launcher/resources.h"

namespace ds::launch {

std::string base64_urlsafe_encode(const std::string& bytes);
// Accepts both the url-safe and the standard alphabet; throws ds::UserError on bad input.
std::string base64_decode(const std::string& text);

// {"localhost": [0, 1]} exactly as Python's json.dumps writes it.
std::string world_info_json(const ActiveResources& active);
std::string encode_world_info(const ActiveResources& active);
// Inverse of encode_world_info; keeps the node order.
ActiveResources decode_world_info(const std::string& b64);

// The global rank of local rank 0 on node `node_rank` (ranks go node by node).
int first_rank_of_node(const ActiveResources& active, int node_rank);
int world_size(const ActiveResources& active);

}  // namespace ds::launch
