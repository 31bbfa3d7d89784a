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
// with its key: an error says which does not. A key held twice (which the apiserver stores from
// another writer's update) pairs as strategicpatch pairs it.
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

// diffList patches a list that merges by key as strategicpatch's diffListsOfMaps does: both
// lists sorted by key (as strategicpatch sorts them), walked together; an element only modified has is added whole,
// one only original has is deleted, a pair is patched. Duplicate keys (which the apiserver
// keeps from a create or update) pair in their order, as in strategicpatch.
func diffList(o, m []any, path, key string, schema Schema) (list []any, order []any, err error) {
	if err := checkKeys(o, path, key); err != nil {
		return nil, nil, fmt.Errorf("patch: original: %w", err)
	}
	if err := checkKeys(m, path, key); err != nil {
		return nil, nil, fmt.Errorf("patch: modified: %w", err)
	}
	if len(o) == 0 {
		return m, nil, nil // all added, in their order, as strategicpatch sends them
	}
	ks := func(e any) string { return fmt.Sprint(e.(map[string]any)[key]) }
	// strategicpatch's order exactly: sort.Sort with its Less (a <= b, sort.StringsAreSorted),
	// which is what pairs duplicates (in reverse order, for short lists).
	ol, ml := slices.Clone(o), slices.Clone(m)
	sort.Sort(byKeyText{ol, ks})
	sort.Sort(byKeyText{ml, ks})
	var changed, deleted []any
	i, j := 0, 0
	for i < len(ol) || j < len(ml) {
		switch {
		case i < len(ol) && j < len(ml) && ks(ol[i]) == ks(ml[j]):
			me := ml[j].(map[string]any)
			sub, err := diffObjects(ol[i].(map[string]any), me, path, schema)
			if err != nil {
				return nil, nil, err
			}
			if len(sub) > 0 {
				sub[key] = me[key]
				changed = append(changed, sub)
			}
			i++
			j++
		case i >= len(ol) || (j < len(ml) && ks(ol[i]) > ks(ml[j])):
			changed = append(changed, ml[j])
			j++
		default:
			deleted = append(deleted, map[string]any{key: ol[i].(map[string]any)[key], directiveMarker: deleteDirective})
			i++
		}
	}
	first := func(e any) int {
		return slices.IndexFunc(m, func(x any) bool { return ks(x) == ks(e) })
	}
	sort.SliceStable(changed, func(a, b int) bool { return first(changed[a]) < first(changed[b]) })
	same := len(o) == len(m)
	for n := 0; same && n < len(o); n++ {
		same = ks(o[n]) == ks(m[n])
	}
	if changed == nil && deleted == nil && same {
		return nil, nil, nil
	}
	list = append(changed, deleted...)
	order = []any{}
	for _, e := range m {
		order = append(order, map[string]any{key: e.(map[string]any)[key]})
	}
	return list, order, nil
}

// checkKeys tells whether every element of a merging list is an object with its key.
func checkKeys(l []any, path, key string) error {
	for i, e := range l {
		obj, ok := e.(map[string]any)
		if !ok {
			return fmt.Errorf("%s[%d] is not an object: the list merges by %q", path, i, key)
		}
		if _, ok := obj[key]; !ok {
			return fmt.Errorf("%s[%d] has no %q, the key the list merges by", path, i, key)
		}
	}
	return nil
}

// byKeyText sorts a merging list by its key's text with strategicpatch's Less (a <= b, not a
// strict order): with sort.Sort, the same algorithm, it puts repeated keys where strategicpatch
// does, which decides how they pair.
type byKeyText struct {
	l  []any
	ks func(any) string
}

func (b byKeyText) Len() int           { return len(b.l) }
func (b byKeyText) Less(i, j int) bool { return b.ks(b.l[i]) <= b.ks(b.l[j]) }
func (b byKeyText) Swap(i, j int)      { b.l[i], b.l[j] = b.l[j], b.l[i] }
