package podutil

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/validation"
)

// FieldPathValue returns the value of a downward API field path of obj (a pointer to an API
// object): metadata.name, .namespace, .uid, .labels, .annotations, or one label or annotation
// as metadata.labels['KEY']. Whole maps are rendered one key="value" per line, sorted.
// An obj without metadata gives "" and no error, as kubectl's ExtractFieldPathAsString.
func FieldPathValue(obj any, fieldPath string) (string, error) {
	accessor, err := meta.Accessor(obj)
	if err != nil {
		return "", nil
	}
	if path, subscript, ok := splitSubscriptedPath(fieldPath); ok {
		switch path {
		case "metadata.annotations":
			if errs := validation.IsQualifiedName(strings.ToLower(subscript)); len(errs) != 0 {
				return "", fmt.Errorf("invalid key subscript in %s: %s", fieldPath, strings.Join(errs, ";"))
			}
			return accessor.GetAnnotations()[subscript], nil
		case "metadata.labels":
			if errs := validation.IsQualifiedName(subscript); len(errs) != 0 {
				return "", fmt.Errorf("invalid key subscript in %s: %s", fieldPath, strings.Join(errs, ";"))
			}
			return accessor.GetLabels()[subscript], nil
		default:
			return "", fmt.Errorf("fieldPath %q does not support subscript", fieldPath)
		}
	}
	switch fieldPath {
	case "metadata.annotations":
		return formatMap(accessor.GetAnnotations()), nil
	case "metadata.labels":
		return formatMap(accessor.GetLabels()), nil
	case "metadata.name":
		return accessor.GetName(), nil
	case "metadata.namespace":
		return accessor.GetNamespace(), nil
	case "metadata.uid":
		return string(accessor.GetUID()), nil
	}
	return "", fmt.Errorf("unsupported fieldPath: %v", fieldPath)
}

// formatMap renders m as key="value" lines sorted by key.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%v=%q", k, m[k])
	}
	return b.String()
}

// splitSubscriptedPath splits "metadata.annotations['KEY']" into its path and KEY; a path
// without a subscript gives ok false.
func splitSubscriptedPath(fieldPath string) (path, subscript string, ok bool) {
	if !strings.HasSuffix(fieldPath, "']") {
		return fieldPath, "", false
	}
	path, subscript, found := strings.Cut(strings.TrimSuffix(fieldPath, "']"), "['")
	if !found || path == "" {
		return fieldPath, "", false
	}
	return path, subscript, true
}
