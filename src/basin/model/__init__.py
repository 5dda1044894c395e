"""basin.model"""
