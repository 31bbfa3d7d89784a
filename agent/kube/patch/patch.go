// Package patch computes the strategic merge patches the agent sends: from the pod or node
// status the apiserver has to the one the agent computed, only what changed, so that fields
// other writers own are left as they are (the kubelet's PatchPodStatus and PatchNodeStatus).
//
// apimachinery's strategicpatch computes them from the Go types' struct tags, and to read
// them it links the OpenAPI models (gnostic, kube-openapi: about 2 MiB of the agent's binary,
// issue 31). The agent patches two kinds of status, whose schema is small and written here
// (Pod, Node): which lists merge element by element, and by which key. Every other list is
// atomic: sent whole when it changed, as strategicpatch does for a list without a strategy.
// The tests hold these tables to the struct tags of k8s.io/api and every patch computed here
// to strategicpatch's own application of it.
package patch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"
)

// Schema names the lists that merge by key: the path of JSON field names from the object's
// root ("status.conditions") to the key of its elements ("type").
type Schema map[string]string

// Pod is the schema of a v1.Pod's status: the lists of PodStatus declared patchStrategy=merge.
// resourceClaimStatuses is also retainKeys, a directive no patch computed here needs: the
// agent refuses pods with resource claims, so it never writes their statuses.
var Pod = Schema{
	"status.conditions":                                    "type",
	"status.hostIPs":                                       "ip",
	"status.podIPs":                                        "ip",
	"status.resourceClaimStatuses":                         "name",
	"status.nodeAllocatableResourceClaimStatuses":          "resourceClaimName",
	"status.nodeAllocatableResourceClaimStatuses.mapping":  "name",
	"status.nodeAllocatableResourceClaimStatuses.overhead": "name",
}

// Node is the schema of a v1.Node's status.
var Node = Schema{
	"status.conditions": "type",
	"status.addresses":  "type",
}

// None is the schema of an object whose patches change no list that merges (an Event's count,
// time and message): every list is sent whole when it changed.
var None = Schema{}

// Directives of the strategic merge patch format, as the apiserver reads them.
const (
	directiveMarker = "$patch"
	deleteDirective = "delete"
	setOrderPrefix  = "$setElementOrder/"
)

// TwoWay returns the strategic merge patch that turns original into modified, both encoded as
// JSON by encoding/json; "{}" when nothing differs. A list that merges must hold objects, each
// with its key, once: an error says which does not.
func TwoWay(original, modified any, schema Schema) ([]byte, error) {
	o, err := decode(original)
	if err != nil {
		return nil, fmt.Errorf("patch: original: %w", err)
	}
	m, err := decode(modified)
	if err != nil {
		return nil, fmt.Errorf("patch: modified: %w", err)
	}
	om, ok1 := o.(map[string]any)
	mm, ok2 := m.(map[string]any)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("patch: original and modified must be JSON objects")
	}
	p, err := diffObjects(om, mm, "", schema)
	if err != nil {
		return nil, err
	}
	return json.Marshal(p)
}

// decode encodes v as JSON and decodes it back into maps, slices and json.Numbers, so that
// numbers keep their exact text in the patch.
func decode(v any) (any, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var out any
	if err := d.Decode(&out); err != nil {
		return nil, err
	}
	return out, nil
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

// diffObjects merges field by field: a field modified lacks is deleted (null), one that
// differs is replaced, or patched in turn when both sides are objects or a list that merges.
func diffObjects(o, m map[string]any, path string, schema Schema) (map[string]any, error) {
	patch := map[string]any{}
	for k, mv := range m {
		ov, ok := o[k]
		if !ok {
			patch[k] = mv
			continue
		}
		if reflect.DeepEqual(ov, mv) {
			continue
		}
		p := join(path, k)
		oo, ook := ov.(map[string]any)
		mo, mok := mv.(map[string]any)
		if ook && mok {
			sub, err := diffObjects(oo, mo, p, schema)
			if err != nil {
				return nil, err
			}
			if len(sub) > 0 {
				patch[k] = sub
			}
			continue
		}
		ol, olk := ov.([]any)
		ml, mlk := mv.([]any)
		if key, merges := schema[p]; merges && olk && mlk {
			list, order, err := diffList(ol, ml, p, key, schema)
			if err != nil {
				return nil, err
			}
			if list != nil {
				patch[k] = list
			}
			if order != nil {
				patch[setOrderPrefix+k] = order
			}
			continue
		}
		patch[k] = mv
	}
	for k := range o {
		if _, ok := m[k]; !ok {
			patch[k] = nil
		}
	}
	return patch, nil
}

// diffList patches a list that merges by key: the elements added whole, those changed by
// their own patch (with their key), those gone by a delete directive; and, when any of that
// or the order changed, the order of modified's elements ($setElementOrder), which the
// apiserver applies so that the merged list is modified's and not the elements' arrival order.
func diffList(o, m []any, path, key string, schema Schema) (list []any, order []any, err error) {
	orig, origOrder, err := byKey(o, path, key)
	if err != nil {
		return nil, nil, fmt.Errorf("patch: original: %w", err)
	}
	mod, modOrder, err := byKey(m, path, key)
	if err != nil {
		return nil, nil, fmt.Errorf("patch: modified: %w", err)
	}
	if len(o) == 0 {
		return m, nil, nil // all added, in their order
	}
	// The elements go in strategicpatch's order, the changes in modified's order, then the
	// deletions sorted by key: the apiserver checks the first against $setElementOrder, and
	// places the elements of its own list that the order does not name by where the patch's
	// are, so another order would give another list.
	var changed, deleted []any
	for _, k := range modOrder {
		me := mod[k]
		oe, ok := orig[k]
		if !ok {
			changed = append(changed, me)
			continue
		}
		sub, err := diffObjects(oe, me, path, schema)
		if err != nil {
			return nil, nil, err
		}
		if len(sub) > 0 {
			sub[key] = me[key]
			changed = append(changed, sub)
		}
	}
	var kept []string
	for _, k := range origOrder {
		if _, ok := mod[k]; ok {
			kept = append(kept, k)
			continue
		}
		deleted = append(deleted, map[string]any{key: orig[k][key], directiveMarker: deleteDirective})
	}
	if changed == nil && deleted == nil && slices.Equal(kept, modOrder) {
		return nil, nil, nil
	}
	sortByKey(deleted, key)
	list = append(changed, deleted...)
	order = []any{}
	for _, k := range modOrder {
		order = append(order, map[string]any{key: mod[k][key]})
	}
	return list, order, nil
}

// sortByKey sorts a list's elements by their key's value as strategicpatch does (as text).
func sortByKey(l []any, key string) {
	sort.SliceStable(l, func(i, j int) bool {
		return fmt.Sprint(l[i].(map[string]any)[key]) < fmt.Sprint(l[j].(map[string]any)[key])
	})
}

// byKey indexes a merging list's elements by their key's value (as JSON, so that a key of any
// type compares exactly), in their order.
func byKey(l []any, path, key string) (map[string]map[string]any, []string, error) {
	index := make(map[string]map[string]any, len(l))
	order := make([]string, 0, len(l))
	for i, e := range l {
		obj, ok := e.(map[string]any)
		if !ok {
			return nil, nil, fmt.Errorf("%s[%d] is not an object: the list merges by %q", path, i, key)
		}
		v, ok := obj[key]
		if !ok {
			return nil, nil, fmt.Errorf("%s[%d] has no %q, the key the list merges by", path, i, key)
		}
		k, err := json.Marshal(v)
		if err != nil {
			return nil, nil, fmt.Errorf("%s[%d].%s: %w", path, i, key, err)
		}
		if _, dup := index[string(k)]; dup {
			return nil, nil, fmt.Errorf("%s has two elements whose %s is %s", path, key, k)
		}
		index[string(k)] = obj
		order = append(order, string(k))
	}
	return index, order, nil
}
