#pragma once
/// kiln's neural-network library: modules, initialisation, optimisers, safetensors I/O.
#include "kiln/kiln.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "nn/serialize.h"
#include "nn/transformer.h"
