package expansion

import "testing"

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "1", "B": "two"}
	for in, want := range map[string]string{
		"$(A)":          "1",
		"x$(B)y":        "xtwoy",
		"$(C)":          "$(C)",
		"$$(A)":         "$(A)",
		"$(A":           "$(A",
		"cost $5":       "cost $5",
		"$(A)-$(B)-$$$": "1-two-$$",
		"":              "",
	} {
		if got := Expand(in, vars); got != want {
			t.Errorf("Expand(%q) = %q, want %q", in, got, want)
		}
	}
	if ExpandAll(nil, vars) != nil {
		t.Error("ExpandAll(nil) is not nil")
	}
}
