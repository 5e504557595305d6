#pragma once
/// The kiln API in one include: tensors, factories, eager ops, compile().
#include "core/tensor.h"
#include "eager/autograd.h"
#include "eager/factories.h"
#include "eager/memory.h"
#include "eager/ops.h"
#include "eager/settings.h"
#include "tracer/compile.h"
