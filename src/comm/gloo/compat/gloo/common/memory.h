// Stands in for gloo/common/memory.h, which Debian 12's libgloo-dev (0.0~git20220518) leaves out
// although gloo/transport/tcp/{pair,context,unbound_buffer}.h include it. Only
// comm/gloo/guarded_transport.cpp needs those headers. Our own minimal definitions of the two
// smart pointers they name: the same layout as the library was built with (one std::shared_ptr,
// one std::weak_ptr), which guarded_transport.cpp checks against the library's object sizes.
#pragma once

#include <memory>

namespace gloo {

template <typename T>
class WeakNonOwningPtr;

// A strong reference taken for the length of one operation.
template <typename T>
class NonOwningPtr final {
 public:
  NonOwningPtr() = default;
  explicit NonOwningPtr(const WeakNonOwningPtr<T>& weak) : ptr_(weak.ptr_.lock()) {}
  T* get() const { return ptr_.get(); }
  T* operator->() const { return ptr_.get(); }
  explicit operator bool() const { return static_cast<bool>(ptr_); }

 private:
  std::shared_ptr<T> ptr_;
};

// A reference that does not keep its object alive.
template <typename T>
class WeakNonOwningPtr final {
 public:
  WeakNonOwningPtr() = default;

 private:
  std::weak_ptr<T> ptr_;
  friend class NonOwningPtr<T>;
};

}  // namespace gloo
