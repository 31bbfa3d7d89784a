// Package sources delivers the pods this node should run: from the apiserver (pods bound to
// the node) and from the static manifest directory. A source tells its Sink about a pod that
// appeared or changed (Update) and, only when it knows for certain, about a pod that is gone
// (Remove). A failed or empty read is never a removal.
package sources

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Sink receives the pods a source delivers; the pod manager implements it.
type Sink interface {
	Update(pod *v1.Pod)
	Remove(uid types.UID, reason string)
}
