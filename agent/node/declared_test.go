package node

import (
	"testing"

	"k8s.io/component-helpers/nodedeclaredfeatures/features"
)

// TestDeclaredFeaturesAreRegistered: every feature the node declares is one the apiserver
// knows by that name (component-helpers' registry, which the apiserver infers a pod update's
// needs from): a misspelt name would be declared and never match, and the update refused.
func TestDeclaredFeaturesAreRegistered(t *testing.T) {
	known := map[string]bool{}
	for _, f := range features.AllFeatures {
		known[f.Name()] = true
	}
	for _, name := range DeclaredFeatures {
		if !known[name] {
			t.Errorf("declared feature %q is not in k8s.io/component-helpers/nodedeclaredfeatures/features.AllFeatures", name)
		}
	}
}
