/* spec_json.h - service specs from JSON (jansson), and YAML documents read as JSON values */
#ifndef OSUB_SPEC_JSON_H
#define OSUB_SPEC_JSON_H

#include <stddef.h>

#include <jansson.h>

#include "oversub/engine.h"

/*
 * Fills spec from a JSON object with the engine's spec fields. Sizes may be numbers (MiB) or
 * strings ("120GiB"). Unknown fields, wrong types, negative or huge numbers are refused with a
 * sentence naming the field in err. Returns 0, OSUB_SPEC_UNKNOWN_FIELD for a field it does not
 * know, or -1. obj is borrowed.
 */
#define OSUB_SPEC_UNKNOWN_FIELD (-2)
int osub_spec_from_json(const json_t *obj, osub_spec_t *spec, char *err, size_t errlen);

/* Writes spec as a JSON object (new reference, owned by the caller; NULL on out of memory). */
json_t *osub_spec_to_json(const osub_spec_t *spec);

/*
 * Reads a YAML file's first document as a JSON value: mappings become objects, sequences
 * arrays, plain scalars integers, reals, booleans or null where they read as such, else
 * strings (quoted scalars stay strings). Returns a new reference, or NULL with a sentence
 * naming the line in err.
 */
json_t *osub_yaml_load_file(const char *path, char *err, size_t errlen);

#endif
